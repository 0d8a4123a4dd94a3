"""Budget held both ways: what four calls in flight spend of llm.max_cost_usd against a local
mock server, honest or ignoring max_tokens (the setup of tests/test_llm_budget.py).

Usage:
  PYTHONPATH=. python scripts/budget_run.py      # this checkout; PYTHONPATH=<checkout> for another
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests.fixtures.mock_openai import MockServer
from tests.test_llm_budget import LIMIT, PROMPT, SLOTS, Ignoring, spend


def main() -> int:
    for server_class in (MockServer, Ignoring):
        answer = None if server_class is Ignoring else " ".join(["tok"] * 500)
        server = server_class(answer=answer).start()
        try:
            client, _ = spend(Path(tempfile.mkdtemp()), server)
        finally:
            server.stop()
        worst = client.worst_case_cost("openai/scripted", PROMPT)
        calls, longest = client.ledger.store.conn.execute(
            "SELECT COUNT(*), MAX(tokens_out) FROM llm_calls"
        ).fetchone()
        print(
            f"{server_class.__name__}: spent ${client.spent():.4f} of ${LIMIT} "
            f"({100 * client.spent() / LIMIT:.0f}%) in {calls} calls, longest answer charged "
            f"{longest} tokens; bound ${LIMIT + SLOTS * worst:.4f} (budget + {SLOTS} worst calls "
            f"of ${worst:.4f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

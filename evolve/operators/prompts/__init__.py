"""The prompt templates of the LLM operators (Jinja2, rendered strictly by evolve.operators.prompting)."""

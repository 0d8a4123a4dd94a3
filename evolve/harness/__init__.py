"""The harness layer: the fitness contract, and what every benchmark's harness shares and candidates never compute.

- ``fitness``: the contract a benchmark implements (``Fitness``, ``Stage``, ``Benchmark``,
  ``EvalContext``) and how it is run safely.
- ``protocol``: the job/verdict exchange with harness processes (nonce'd JSON lines, undumpable
  processes, ``python -P``).
- ``clock`` (harness side) and ``stream`` (the training program's side): the harness's clock,
  the timed data stream (synthetic before the clock, real while it runs, none after the stop)
  and the checkpoint fixed at the stop; ``savetime``: how soon after the stop the checkpoint
  must be reported (the step in flight and the write, measured on the machine).
- ``reaper``: ending a harness process's child tree (the sandbox's scan and kill).
- ``orphans``: adopting and reaping, for one sandboxed command, the processes a candidate orphans, so their CPU time counts.
- ``lm``: cross-entropy and bytes from logits; causality and row-independence probes that
  cannot be told from scored batches; weight perturbation for probes of fresh models.
- ``exported`` and ``exporter``: a trained model scored as a pure function: the candidate's
  model code exported once after the stop (``torch.export``, in a process with no data), the
  graph screened, checked and bound to the checkpoint's own weights by harness code only.
- ``download``, ``documents``, ``tokenizer``, ``hashing``: resumable verified downloads,
  document readers (and the standard library's test package, the CPU scales' hidden
  validation text), BPE training and token bytes, SHA-256 of files and the harness hash
  computed from a fitness's imports.
- ``gpus``: GPU placement (the backends' slots and the benchmarks' measurement scripts).
- ``audit``: static detectors of reward hacking in the code a candidate added to its parent.
- ``plaincopy``: copies of files a sandboxed program wrote, never through a link (symlink or
  hard link to a file hidden from it).
- ``phases``: where an evaluation's wall time goes (``time_<phase>`` seconds adding up to it).
- ``profiling``: a torch.profiler summary of a few timed training steps, for feedback only.
- ``once``: a value measured once per machine and key under a lock (the seed's references,
  a compile cache filled by the seed).
- ``bytecode``: the libraries' Python bytecode kept in that compile cache, read-only to
  candidates (where libraries ship without it, torch's imports are compiled again per process);
  ``compile_cache``: the whole cache (compilers' and bytecode) shared with every run through a
  private layer, written only by the harness's warm-up run of the seed.
- ``bare``: a training program run without the harness (rows in memory, the stream's rules
  and timing kept in-process), to measure what the harness costs its speed.
"""

__all__ = [  # modules, each imported where it is used (``lm`` and ``exported`` load torch)
    "as_found",
    "audit",
    "bare",
    "bytecode",
    "clock",
    "compile_cache",
    "confine",
    "documents",
    "download",
    "exported",
    "exporter",
    "fitness",
    "gpus",
    "hashing",
    "lm",
    "once",
    "orphans",
    "phases",
    "plaincopy",
    "profiling",
    "protocol",
    "reaper",
    "savetime",
    "stream",
    "tokenizer",
]

"""gdnctl's trainer beside Megatron-Bridge's own loop (benchmarks/megatron_bridge_loop.py), like for like.

`benchmarks/trainer_throughput.py compare` runs the campaign and `... report` recomputes it from its records, through
the same functions:

- plan.py: the arms (gdnctl, then the peer, per GDN kernel, round after round) and the time a campaign takes;
- switches.py: the environment gdnctl's launch exports, given to the peer too (its own kernel cache aside);
- steps.py: each side's per-step records, and the steady window: from two steps after the side's own CUDA-graph
  capture, for the medians and the memory peaks alike;
- campaign.py: the record of a campaign (campaign.json beside each arm's step log and console log);
- report.py: the figures per arm, the ratio per round of arms on the same GDN kernel, its median and spread;
- runner.py: the live campaign (subprocesses, progress lines, a failed arm kept with its log's tail);
- token_stream.py: loaded inside the peer, it hands Megatron-Core's mock GPT dataset the rows gdnctl's trainer
  trains, so both loops train one token stream.
"""

"""Evaluate a policy on the domain's target tasks (the demo's own task set).

`tasks.py`: the task sets as Environments rewarded by each task's code verdict;
`policy.py`: the config, the policy's endpoint and one episode's record; `shards.py`:
episodes through the training stage's rollout code, in shards; `runner.py`: the entry
points (`run_evaluation`, the `evaluate` job), written as a JSONL file (runs inside jobs:
never opens the store). Nothing in this package opens the store: importing a finished
evaluation as a dataset is a use case (`trace_lib.workbench.evaluation.import_episodes`).
"""

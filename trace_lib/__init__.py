"""TRACE Workbench: turn an agent's recurring failures into capability-targeted training.

Stages (each a subpackage, a CLI verb and a Streamlit page): ingest and explore
trajectories, diagnose lacking capabilities, build capability environments, train one
LoRA adapter per capability with GRPO, compose them with token-level gates.
"""

__version__ = "0.1.0"

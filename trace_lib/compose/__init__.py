"""Stage 4, compose: frozen base + K LoRA adapters mixed per token by trained top-1 gates.

gated (the model), adapters (PEFT folders, exact merge), traces (routing traces), views
(pictures), gate_training (warm start + GRPO job), evaluate (composition vs collapse),
local_client / serving (the model as a chat policy, in process and over HTTP), catalog
(the DuckDB rows; app/CLI side only). See docs/COMPOSE.md.
"""

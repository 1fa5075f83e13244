"""What training and composition both stand on: base models and tokenizers, the chat
format, the policy engine and its OpenAI-compatible server, the policy client, LoRA and
the multi-turn rollout. Nothing here imports `store`: it runs inside jobs."""

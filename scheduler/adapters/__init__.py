"""LoRA adapters: a tenant's fine-tuned variants of a served model, registered by the staff,
kept in the files storage and loaded on the engines of their base model's pool when a
request names them (docs/decisions/0015-lora-adapters-per-tenant.md)."""

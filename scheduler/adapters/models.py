"""A registered LoRA adapter: one tenant's, for one served model."""

from __future__ import annotations

from django.db import models

from capacity.units import format_units


class Adapter(models.Model):
    """A LoRA adapter a tenant calls by `name` in place of its base model. Only its tenant
    sees it: to any other tenant the name is an unknown model. Its files live in the files
    storage under `storage_prefix`; its units are held against its tenant's quota."""

    name = models.CharField(
        max_length=200,
        unique=True,
        help_text=(
            "The model name its tenant asks for; unique on the platform, as it is the name "
            "the engines load it under."
        ),
    )
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="adapters")
    base_model = models.CharField(
        max_length=200, help_text="The served model name whose engines load it."
    )
    rank = models.PositiveSmallIntegerField(help_text="Its LoRA rank (adapter_config.json r).")
    size_bytes = models.PositiveBigIntegerField(help_text="Its files' bytes.")
    units = models.PositiveIntegerField(help_text="256 MiB units held against its tenant's quota.")
    storage_prefix = models.CharField(max_length=300, help_text="Its folder in the files storage.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "scheduler"
        ordering = ("name",)
        constraints = (
            models.CheckConstraint(condition=models.Q(units__gte=1), name="adapter_units_positive"),
        )

    def __str__(self) -> str:
        return self.name

    @property
    def units_display(self) -> str:
        return format_units(self.units)

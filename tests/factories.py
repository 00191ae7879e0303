import factory

from protocol.classes import REQUEST_CLASSES
from tenants.models import Tenant


class TenantFactory(factory.django.DjangoModelFactory[Tenant]):
    class Meta:
        model = Tenant
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"tenant-{n}")
    name = factory.LazyAttribute(lambda t: t.slug.replace("-", " ").title())
    weight = 1.0
    quota_units = 8
    burst_units = 0
    # Every class, where the platform's default grants fewer (GPUSHARE_DEFAULT_CLASSES).
    allowed_classes = factory.LazyFunction(lambda: list(REQUEST_CLASSES))

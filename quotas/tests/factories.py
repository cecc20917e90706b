"""factory_boy factories for users, teams and memberships."""

import factory
from django.contrib.auth import get_user_model

from quotas.models import Membership, Team


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("pass-word-123")


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team
        django_get_or_create = ("slug",)

    name = factory.Sequence(lambda n: f"Team {n}")
    slug = factory.Sequence(lambda n: f"team{n}")
    namespace = factory.LazyAttribute(lambda t: f"trainyard-{t.slug}")
    gpu_milli = 4000
    gpu_memory_mib = 96 * 1024
    cpu_milli = 64000
    memory_mib = 256 * 1024


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    team = factory.SubFactory(TeamFactory)
    user = factory.SubFactory(UserFactory)
    role = "member"

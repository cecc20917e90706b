"""kernel.api.ModelSerializer: DRF's model serializer with the fields built from the model once per class; every
instance gets fields of its own, and answers and validates as DRF's own does."""

import pytest
from rest_framework import serializers

from kernel.api import ModelSerializer
from quotas.api import SpecSerializer
from quotas.models import Queue, ResourceSpec

pytestmark = [pytest.mark.django_db]


class PlainQueue(serializers.ModelSerializer):
    class Meta:
        model = Queue
        fields = ["name", "state", "priority", "gpu_milli", "teams"]


class CachedQueue(ModelSerializer):
    class Meta(PlainQueue.Meta):
        pass


class NarrowerQueue(CachedQueue):
    class Meta(CachedQueue.Meta):
        fields = ["name", "state"]


def test_each_instance_has_fields_of_its_own_bound_to_it():
    one, two = CachedQueue(), CachedQueue()
    assert set(one.fields) == set(two.fields) == {"name", "state", "priority", "gpu_milli", "teams"}
    for name in one.fields:
        assert one.fields[name] is not two.fields[name]
        assert one.fields[name].parent is one and two.fields[name].parent is two
    assert list(NarrowerQueue().fields) == ["name", "state"]  # a subclass builds its own
    assert list(CachedQueue().fields) == ["name", "state", "priority", "gpu_milli", "teams"]


def test_the_model_is_read_once_per_class(monkeypatch):
    assert CachedQueue().fields  # built (by this test or an earlier one)
    calls = []
    original = serializers.ModelSerializer.build_field
    monkeypatch.setattr(
        serializers.ModelSerializer, "build_field", lambda self, *a, **k: calls.append(a[0]) or original(self, *a, **k)
    )
    for _ in range(3):
        assert CachedQueue().fields
    assert calls == []
    for _ in range(3):
        assert PlainQueue().fields
    assert len(calls) == 3 * 5  # DRF's own builds every field for every instance


def test_answers_and_validation_are_drfs_own():
    queue = Queue.objects.create(name="cached-fields", priority=3, gpu_milli=4000)
    assert CachedQueue(queue).data == PlainQueue(queue).data
    assert CachedQueue(queue).data["name"] == "cached-fields"
    spec = ResourceSpec.objects.create(name="cached-spec", tier="shared", gpu_milli=250, gpu_memory_eighths=2)

    class PlainSpec(serializers.ModelSerializer):
        class Meta(SpecSerializer.Meta):
            pass

    assert SpecSerializer(spec).data == PlainSpec(spec).data
    bad = {"name": "", "state": "sideways", "priority": "high", "gpu_milli": -1, "teams": [999999]}
    for data in (bad, {"name": "x" * 500}):
        cached, plain = CachedQueue(data=data), PlainQueue(data=data)
        assert cached.is_valid() is plain.is_valid() is False
        assert cached.errors == plain.errors
        assert {k: [e.code for e in v] for k, v in cached.errors.items()} == {
            k: [e.code for e in v] for k, v in plain.errors.items()
        }

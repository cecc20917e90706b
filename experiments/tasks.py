"""Celery tasks of experiments: the periodic pass over every live experiment, and one experiment at once."""

from celery import shared_task

from experiments import services


@shared_task(name="experiments.advance", soft_time_limit=120, time_limit=180)
def advance_experiments() -> dict:
    return services.experiments_advance()


@shared_task(name="experiments.advance_one", soft_time_limit=60, time_limit=90)
def advance_experiment(experiment_id: str) -> dict:
    from django.db import transaction

    with transaction.atomic(durable=True):
        return services.experiment_advance(experiment_id=experiment_id)

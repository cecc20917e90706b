"""The connection to the Kubernetes API that the Volcano backend and the image builder share.

In order: `TRAINYARD_K8S_API_URL` (a plain URL, as the test suite's fake API server gives), `TRAINYARD_K8S_KUBECONFIG`
(with `TRAINYARD_K8S_CONTEXT`), the in-cluster service account, then `~/.kube/config`.
"""

from __future__ import annotations

from django.conf import settings
from kubernetes import client as k8s
from kubernetes import config as k8s_config


def api_client() -> k8s.ApiClient:
    if settings.TRAINYARD_K8S_API_URL:
        configuration = k8s.Configuration(host=settings.TRAINYARD_K8S_API_URL)
        configuration.proxy = None
        return k8s.ApiClient(configuration)
    if settings.TRAINYARD_K8S_KUBECONFIG:
        return k8s_config.new_client_from_config(
            config_file=str(settings.TRAINYARD_K8S_KUBECONFIG), context=settings.TRAINYARD_K8S_CONTEXT or None
        )
    configuration = k8s.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except k8s_config.ConfigException:
        return k8s_config.new_client_from_config(context=settings.TRAINYARD_K8S_CONTEXT or None)
    return k8s.ApiClient(configuration)

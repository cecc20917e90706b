"""Portal page views: they call the same selectors and services as the API."""

from django.http import HttpResponse


def home(request):
    return HttpResponse("Trainyard")

"""Planning a build: the resources it gets, per-unit compile costs and their schedule, costs learned
from a site's own builds."""

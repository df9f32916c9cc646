"""Building a recipe with rattler-build: the options of one build, a build in parts, stopping it."""

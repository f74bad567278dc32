# A package a rank imports (integration/prewarm_auto_test.go).
from . import sub  # noqa: F401

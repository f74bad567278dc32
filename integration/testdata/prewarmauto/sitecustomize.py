# The user's sitecustomize: --prewarm auto's hook shadows it and must run
# it (integration/prewarm_auto_test.go checks the mark).
import builtins

builtins._ftl_test_sitecustomize = True

# ft-launcher: put on a Python rank's PYTHONPATH by the launcher (package
# stacks). It lets the launcher read the rank's stacks when the rank hangs
# or dies by a signal (_ftl_stacks), takes its directory off sys.path and
# PYTHONPATH again, and runs the sitecustomize this one shadows (the
# user's or the distribution's), so a script sees no difference but
# _ftl_stacks in sys.modules.
import _ftl_stacks

_ftl_stacks.install()
_ftl_stacks.chain()

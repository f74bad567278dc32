# ft-launcher --prewarm auto: put first on a rank's PYTHONPATH by the
# launcher (prewarm/learn.go). It reports the modules the rank imports
# (_ftl_learn), takes its directory off sys.path and PYTHONPATH again, and
# runs the sitecustomize this one shadows (the user's or the
# distribution's), so a script sees no difference but _ftl_learn in
# sys.modules and an audit hook.
import _ftl_learn

_ftl_learn.install()
_ftl_learn.chain()

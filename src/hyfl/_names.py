"""Names of the choices the ``hyfl`` command offers, in a module that imports nothing.

The modules that implement the choices import these tuples from here, so the
command can list them in its help without importing NumPy-heavy code (``hyfl
--help`` stays fast); a test checks that the registries agree.
"""

STEP_RULES = ("cocoa", "safe", "theory", "paper")
"""Registry of HyFDCA step rules (drives validation and CLI choices); ``cocoa`` is the default."""

HYPERPARAMETER_FLAGS = ("iic", "local_steps", "step_rule", "a", "b", "mu", "eta0", "batch_size")
"""The hyperparameters ``hyfl run`` and ``hyfl compare`` have a flag of their own for
(``--step-rule`` ...); every hyperparameter, these too, is also ``--param KEY=VALUE``."""

CIPHER_NAMES = ("none", "paillier", "packed", "ckks")
"""The keys of :data:`hyfl.privacy.ciphers.CIPHERS`, in order."""

DEFAULT_HE_COSTS = "auto"
HE_COST_SOURCES = ("auto", "paper", "measured")
"""Named choices of ``--he-costs`` besides cipher names (anything else is a JSON file path)."""

DEFAULT_HE_LAYOUT = "cipher"
HE_LAYOUTS = ("cipher", "sample")
"""Named choices of ``he_layout`` besides cipher names."""

CLASS_WEIGHTS = ("balanced",)
"""Named ``class_weight`` choices (scikit-learn's): ``balanced`` weights each class's
loss by ``n_samples / (n_classes * its count)``."""

INTERCEPT_SCALING = 1.0
"""Default value of the constant intercept column (liblinear's ``intercept_scaling``)."""

LOSS_NAMES = ("hinge", "logistic", "squared", "smoothed_hinge")
"""The keys of :data:`hyfl.losses.LOSSES`, in order."""

ALGORITHM_NAMES = ("hyfdca", "fedavg", "hyfem", "hyfem-avg", "fedsgd", "fedbcd-p", "fedbcd-s",
                   "fedpbcd", "fedh-g", "fedh-n", "fedh-k", "disco", "mix-lr",
                   "hyfem-nn", "hyfem-nn-avg",
                   "fedbcd-nn", "fedbcd-nn-s", "fedsgd-nn", "fedbcd-nn-cnn")
"""The keys of :data:`hyfl.algorithms.ALGORITHMS`, in order (help and shell completion)."""

REPORT_FORMATS = ("html", "markdown")
"""The formats ``hyfl report`` writes."""

KEY_SCHEME_NAMES = ("paillier", "packed", "ckks")
"""The keys of :data:`hyfl.deploy.keys.KEY_SCHEMES`: the ciphers ``hyfl deploy keys`` serves."""

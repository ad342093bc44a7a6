"""hyfl: hybrid federated learning of convex linear models.

The data matrix is split across clients by samples *and* features. The centre
of the library is HyFDCA, a primal-dual algorithm that reaches the same model
as central training; around it sit the losses, partitions, a fast simulation
engine, data loaders and the ``hyfl`` command.
"""

__version__ = "0.1.0"

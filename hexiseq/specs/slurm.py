"""The `slurm:` section of a cluster file: how the cluster's nodes are reached through Slurm.

```yaml
slurm:
  partitions: {H100-SXM: h100, A100-80GB: a100}   # GPU type -> partition
  account: my-project                              # optional: --account, --qos, --constraint
  qos: normal
```

`hexiseq launch --slurm` uses it when no `--partition` is given (hexiseq/runs/slurm.py).
"""

from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass

from .schema import STRICT, KnownKeys, StrictStr


@dataclass(frozen=True, config=STRICT)
class SlurmSection(KnownKeys):
    """Slurm settings of a cluster: the partition of each GPU type, and optional job options."""

    partitions: Annotated[
        dict[StrictStr, StrictStr],
        Field(description="GPU type (a key of data/gpus.yaml) -> the Slurm partition of its nodes"),
    ]
    account: Annotated[StrictStr | None, Field(description="sbatch --account")] = None
    qos: Annotated[StrictStr | None, Field(description="sbatch --qos")] = None
    constraint: Annotated[StrictStr | None, Field(description="sbatch --constraint (node features)")] = None

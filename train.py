"""python train.py: the same command as jaxformer-train (jax_transformer/commands/train.py);
`python train.py --help` lists every flag."""

import sys

from jax_transformer.commands.train import main

if __name__ == "__main__":
    sys.exit(main())

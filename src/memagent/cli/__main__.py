"""`python -m memagent.cli ...` (and `torchrun ... -m memagent.cli train ...`)."""
from memagent.cli import main

if __name__ == "__main__":
    main()

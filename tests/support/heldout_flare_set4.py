"""The held-out runtime built with its row cache's policy set4 compiled in."""

from heldout_flare import serve

if __name__ == "__main__":
    serve("set4")

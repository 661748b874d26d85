"""The held-out runtime built with its row cache's policy two_choice compiled in."""

from heldout_flare import serve

if __name__ == "__main__":
    serve("two_choice")

"""The arms the compression benchmark compares, by the names its result files use.

Result files key the 1,000-step accuracy by these names, so the benchmark that writes them and
every reader that renders them share this one table instead of a copy each.
"""

# What the arms of the 1,000-step accuracy are called (in the benchmark's log and in reports);
# `{length}` is the token window the full-context control reads.
LONG_ARM_NAMES = {
  "compressed": "compressed",
  "full_context_window": "full-context control on its last {length} tokens",
  "uncompressed_memory": "stage-1 memory (every step, float32)",
}

# A trained arm's name in the 1,000-step accuracy where it differs: the token-level control
# reads a window of the long episode, not its whole context.
LONG_ARM_OF = {"full_context": "full_context_window"}

"""Results as data: claims declared before their runs (experiments/claims/*.toml), evaluated
against the result files under results/, rendered as RESULTS.md and plotted by the notebooks.
Nothing in the training library imports this package."""

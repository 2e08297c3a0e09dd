"""Three-stage context compression: semantic encoder -> LSTM redundancy filter -> INT8."""

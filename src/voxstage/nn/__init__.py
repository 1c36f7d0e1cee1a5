"""Small neural-network building blocks shared by the model families."""

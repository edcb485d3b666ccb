"""A Flower app whose own ServerApp and ClientApp use fedprivopt's DP strategies."""

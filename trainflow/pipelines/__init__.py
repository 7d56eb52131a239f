"""Pure Ray and PyTorch logic, one stage per module; never imports prefect."""

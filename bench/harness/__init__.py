"""What every experiment uses: the load generator, the TorchServe harness, CPU watching, builds."""

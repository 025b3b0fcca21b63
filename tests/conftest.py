pytest_plugins = ["tests.slurm_fixture"]

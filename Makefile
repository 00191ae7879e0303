# The two commands of README.md, and a few for developers.
.PHONY: run test lint setup

run:  ## install what is missing and run the platform (web, worker, beat, Redis)
	bash scripts/run.sh

test:  ## install what is missing, then ruff, mypy, the import contracts and every test
	bash scripts/test.sh $(ARGS)

lint:  ## ruff, mypy and the import contracts (pyproject.toml [tool.importlinter])
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy . && .venv/bin/lint-imports

setup:
	bash scripts/bootstrap.sh

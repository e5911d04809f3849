from heteroflow.cli.main import app

app()

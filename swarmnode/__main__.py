from swarmnode.cli import app

app(prog_name="swarmnode")

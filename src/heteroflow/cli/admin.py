"""``heteroflow admin`` and ``heteroflow db``: tokens, tenants and migrations, straight on the database."""

from __future__ import annotations

from typing import Annotated

import typer
from sqlalchemy.engine import Engine

from heteroflow.core.clock import SystemClock
from heteroflow.core.ids import TenantId
from heteroflow.platform.auth import InvalidScopeError, parse_scopes
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.storage.db import DatabaseUrlError, create_db_engine, upgrade_database
from heteroflow.storage.token_store import SqlTokenStore

app = typer.Typer(help="Administer tokens and tenants.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)

DatabaseUrl = Annotated[str | None, typer.Option(help="sqlite:///PATH or postgresql://… [env HETEROFLOW_DATABASE_URL]")]


def engine_for(database_url: str | None) -> Engine:
    """An engine on ``--database-url`` (or the server's setting), schema migrated."""
    url = database_url or ServerSettings.load().database_url
    try:
        engine = create_db_engine(url)
    except DatabaseUrlError as exc:
        raise typer.BadParameter(str(exc), param_hint="--database-url") from exc
    upgrade_database(engine)
    return engine


def _store(database_url: str | None) -> SqlTokenStore:
    return SqlTokenStore(engine_for(database_url))


@app.command("create-token")
def create_token(
    scopes: Annotated[
        str,
        typer.Option(
            help="Comma-separated: nodes:read, nodes:write, agent, alerts:write, metrics:read, serving:read, admin"
        ),
    ],
    tenant: Annotated[str | None, typer.Option(help="Limit the token to this tenant's nodes (created if new)")] = None,
    name: Annotated[str, typer.Option(help="A label to recognise the token by")] = "cli",
    database_url: DatabaseUrl = None,
) -> None:
    """Create an API token. The token is printed once, as the last line of standard output."""
    try:
        parsed = parse_scopes(scopes)
    except InvalidScopeError as exc:
        raise typer.BadParameter(str(exc), param_hint="--scopes") from exc
    store = _store(database_url)
    now = SystemClock().now()
    tenant_id: TenantId | None = None
    if tenant is not None:
        if not tenant.strip():
            raise typer.BadParameter("the tenant name is empty", param_hint="--tenant")
        tenant_id, created = store.ensure_tenant(tenant.strip(), now=now)
        if created:
            typer.echo(f"created tenant {tenant.strip()!r}", err=True)
    token_id, token = store.create_token(name=name, scopes=parsed, tenant_id=tenant_id, now=now)
    typer.echo(f"token id {token_id} scopes {','.join(sorted(parsed))} tenant {tenant or '-'}", err=True)
    typer.echo(token)


@app.command("revoke-token")
def revoke_token(token_id: str, database_url: DatabaseUrl = None) -> None:
    """Revoke a token by its id (servers stop accepting it within their auth cache time)."""
    from heteroflow.core.ids import TokenId

    if not _store(database_url).revoke(TokenId(token_id), now=SystemClock().now()):
        typer.echo(f"no live token with id {token_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"revoked {token_id}")


@db_app.command("upgrade")
def upgrade(database_url: DatabaseUrl = None) -> None:
    """Apply every pending schema migration."""
    _store(database_url)
    typer.echo("database schema is up to date")

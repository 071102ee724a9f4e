"""`trackway notify status`: each message the outbox holds, and each destination's delivery (reports/outbox.py)."""

from __future__ import annotations

import typer

from trackway.cli.context import app_context
from trackway.cli.jsonout import print_json, to_jsonable

notify_app = typer.Typer(help="Notifications: each message's state and each destination's delivery.",
                         no_args_is_help=True, rich_markup_mode=None)

MESSAGE_COLUMNS = ("key", "kind", "run_id", "title", "state", "tries", "last_error", "created_at", "sent_at",
                   "claimed_by", "lease_until")
DELIVERY_COLUMNS = ("destination", "state", "tries", "last_error", "tried_at", "sent_at", "idempotency_key")


@notify_app.command("status")
def status(
    ctx: typer.Context,
    limit: int = typer.Option(20, "--limit", min=1, help="How many messages, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The newest messages: state, tries, last error and sent at, with each destination's delivery."""
    from sqlalchemy import select

    from trackway.ledger.schema import notification_deliveries, notifications

    app = app_context(ctx)
    with app.ledger.read() as conn:
        messages = conn.execute(select(notifications).order_by(notifications.c.created_at.desc()).limit(limit)).mappings().all()
        keys = [m["key"] for m in messages]
        deliveries = conn.execute(select(notification_deliveries).where(notification_deliveries.c.key.in_(keys))
                                  .order_by(notification_deliveries.c.destination)).mappings().all() if keys else []
    shown = _configured(app.settings.notify_urls)
    by_key: dict[str, list[dict]] = {}
    for d in deliveries:
        entry = {c: to_jsonable(d[c]) for c in DELIVERY_COLUMNS}
        entry["url"] = shown.get(d["destination"])  # secrets masked; None: no longer in [notify] urls
        by_key.setdefault(d["key"], []).append(entry)
    out = [{**{c: to_jsonable(m[c]) for c in MESSAGE_COLUMNS}, "destinations": by_key.get(m["key"], [])}
           for m in messages]
    if as_json:
        print_json(out)
        return
    from trackway.cli.render import KEY, Column, console, say, short_time, table

    if not out:
        say(console, "no notification recorded")
        return
    rows = []
    for m, record in zip(out, messages):
        rows.append([m["key"], m["state"], m["tries"], short_time(record["created_at"]),
                     short_time(record["sent_at"]), m["last_error"] or "-"])
        for d, raw in zip(m["destinations"], [r for r in deliveries if r["key"] == m["key"]]):
            rows.append(["  → " + (d["url"] or d["destination"]), d["state"], d["tries"], short_time(raw["tried_at"]),
                         short_time(raw["sent_at"]), d["last_error"] or "-"])
    console.print(table(None, [Column("message / destination", KEY, shorten_to=30), Column("state", 90),
                               Column("tries", 80, right=True), Column("recorded / tried (UTC)", 40), Column("sent (UTC)", 60),
                               Column("last error", 50, shorten_to=20)], rows))


def _configured(urls: tuple[str, ...]) -> dict[str, str]:
    """The configured destinations by the name the ledger gives them, each shown as apprise masks it."""
    if not urls:
        return {}
    from trackway.reports.outbox import destination_of

    try:
        import apprise
    except ImportError:
        return {destination_of(url): url.split("://")[0] + "://..." for url in urls}
    shown = {}
    for url in urls:
        service = apprise.Apprise.instantiate(url)
        shown[destination_of(url)] = service.url(privacy=True) if service else url.split("://")[0] + "://..."
    return shown


def register(app: typer.Typer) -> None:
    app.add_typer(notify_app, name="notify")

"""The morning report's charts: Vega-Lite specifications (altair) rendered to SVG offline by
vl-convert, one function per kind of chart, each scaled to the screen's width."""

from __future__ import annotations

from typing import Any

CHART_WIDTH = 480  # scaled to the screen: small enough that a phone can read its text


CHART_HEIGHT = 220


BUCKETS = (
    ("owed_0_29", "0-29 days"),
    ("owed_30_59", "30-59"),
    ("owed_60_89", "60-89"),
    ("owed_90_plus", "90+"),
)


def _render(chart: Any) -> str:
    import vl_convert

    # Not validated against Vega-Lite's JSON schema at every night's report (jsonschema, ~0.2 s
    # of CPU): the specs are this module's code, and its tests render every one of them.
    svg = vl_convert.vegalite_to_svg(chart.to_dict(validate=False))
    return str(svg)


def _base(rows: list[dict[str, Any]]) -> Any:
    import altair as alt

    # The rows are JSON values already (ISO dates, floats): inline, without a pandas DataFrame
    # (pandas' import was ~0.4 s of CPU of every night's report; the SVGs are byte-identical).
    return alt.Chart(alt.Data(values=rows)).properties(width=CHART_WIDTH, height=CHART_HEIGHT)


def _legend() -> Any:
    import altair as alt

    return alt.Legend(orient="bottom", title=None, columns=3)


def line_chart(rows: list[dict[str, Any]], value: str, fmt: str) -> str:
    if not rows:
        return ""
    import altair as alt

    chart = (
        _base(rows)
        .mark_line(point=len({r["night"] for r in rows}) < 3)
        .encode(
            x=alt.X("night:T", title=None, axis=alt.Axis(format="%b %d")),
            y=alt.Y(f"{value}:Q", title=None, axis=alt.Axis(format=fmt)),
            color=alt.Color("store:N", legend=_legend()),
        )
    )
    return _render(chart)


def area_chart(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    import altair as alt

    # An area over one night has no width: a history's first night is a stacked bar.
    one_night = len({r["night"] for r in rows}) < 2
    chart = (_base(rows).mark_bar() if one_night else _base(rows).mark_area()).encode(
        x=alt.X("night:T", title=None, axis=alt.Axis(format="%b %d")),
        y=alt.Y("amount:Q", title=None, stack="zero", axis=alt.Axis(format="$,.0f")),
        color=alt.Color(
            "bucket:N",
            sort=[label for _, label in BUCKETS],
            scale=alt.Scale(range=["#9ecae1", "#fdae6b", "#f16913", "#a50f15"]),
            legend=_legend(),
        ),
        order=alt.Order("order:Q"),
    )
    return _render(chart)


def month_bars(rows: list[dict[str, Any]], value: str) -> str:
    """A month's figures side by side, month after month."""
    if not rows:
        return ""
    import altair as alt

    chart = (
        _base(rows)
        .mark_bar()
        .encode(
            x=alt.X("month:O", title=None),
            xOffset=alt.XOffset("figure:N", sort=alt.EncodingSortField("order")),
            y=alt.Y(f"{value}:Q", title=None, axis=alt.Axis(format="$,.0f")),
            color=alt.Color("figure:N", sort=alt.EncodingSortField("order"), legend=_legend()),
        )
    )
    return _render(chart)


def cohort_chart(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    import altair as alt

    chart = (
        _base(rows)
        .mark_line(point=True)
        .encode(
            x=alt.X("months:Q", title="months since joining", axis=alt.Axis(format="d", tickMinStep=1)),
            y=alt.Y("retention:Q", title=None, axis=alt.Axis(format=".0%"), scale=alt.Scale(domain=[0, 1])),
            color=alt.Color("cohort:N", legend=_legend()),
        )
    )
    return _render(chart)


def bar_chart(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    import altair as alt

    chart = (
        _base(rows)
        .mark_bar()
        .encode(
            x=alt.X("day:T", title=None, axis=alt.Axis(format="%b %d")),
            y=alt.Y("amount:Q", title=None, stack="zero", axis=alt.Axis(format="$,.0f")),
            color=alt.Color("store:N", legend=_legend()),
        )
    )
    return _render(chart)

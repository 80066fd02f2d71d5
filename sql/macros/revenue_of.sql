{#- revenue_by_store_day's figures of `lines` (sales lines), `sign` '-' to take them out: per
    store, local business date and line type, the receipts not voided, their units, amount and tax. -#}
{% macro revenue_of(lines, sign) %}
    select
        storecode,
        business_date,
        type,
        {{ sign }} count(distinct receipt_number) as transactions,
        {{ sign }} cast(coalesce(sum(quantity), 0) as bigint) as quantity,
        {{ sign }} cast(coalesce(sum(amount), 0) as decimal(38, 2)) as amount,
        {{ sign }} cast(coalesce(sum(tax), 0) as decimal(38, 2)) as tax
    from {{ lines }}
    where not is_voided
    group by storecode, business_date, type
{% endmacro %}

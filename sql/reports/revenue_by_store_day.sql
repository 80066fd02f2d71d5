-- model: reports.revenue_by_store_day
-- grain: one row per store, local business date and line type that had revenue, over the whole
--        history the warehouse holds (each transaction in its newest fetched version)
-- key: storecode, business_date, type
-- enum: type in (R, P, M, 1, G, other)
-- Voided transactions are not revenue. transactions counts distinct receipts; amount is before
-- tax. The store is the transaction's storecode, the date its local date.
SELECT
    storecode,
    business_date,
    type,
    count(DISTINCT receipt_number) AS transactions,
    CAST(coalesce(sum(quantity), 0) AS BIGINT) AS quantity,
    CAST(coalesce(sum(amount), 0) AS DECIMAL(38, 2)) AS amount,
    CAST(coalesce(sum(tax), 0) AS DECIMAL(38, 2)) AS tax
FROM marts.sales_lines
WHERE NOT is_voided
GROUP BY storecode, business_date, type

"""What managers read: the report CSVs, the workbook, the HTML morning report, the CLI's tables.

``reports.py`` writes all of a night's exports in one place; ``export.py`` the CSVs,
``workbook.py`` the XLSX, both from ``report_table.py``; ``morning.py`` the HTML page;
``table_print.py`` the one printer of the CLI's tables.

Invariant: exports read the published catalogs only, and money is exact to the cent.
"""

"""The prompts of ``bench_spec``: a code edit, a text rewrite and an open-ended chat.

The first two quote what the answer should largely repeat (the case prompt lookup is
for); the third quotes nothing.
"""

from __future__ import annotations

CODE = """def summarize_orders(orders, tax_rate):
    totals = {}
    for order in orders:
        customer = order["customer"]
        amount = order["amount"]
        if order.get("discount"):
            amount = amount - order["discount"]
        amount = amount * (1 + tax_rate)
        if customer not in totals:
            totals[customer] = 0
        totals[customer] = totals[customer] + amount
    result = []
    for customer, total in totals.items():
        result.append({"customer": customer, "total": round(total, 2)})
    result.sort(key=lambda row: row["total"], reverse=True)
    return result


def top_customers(orders, tax_rate, limit):
    rows = summarize_orders(orders, tax_rate)
    return rows[:limit]
"""

TEXT = (
    "Our team have been working on the new website for the last three month. The design "
    "are finished and most of the pages is ready, but the search feature still need some "
    "work because it return wrong results when the query contain numbers. We also want to "
    "add a dark mode, which many users has asked for, and to make the pages load faster on "
    "mobile phones. We expects to launch the site at the end of next month, if the testing "
    "go well and nobody find any serious problem."
)

WORKLOADS: dict[str, str] = {
    "code edit": (
        "Rename the variable `amount` to `price` everywhere in this Python code. "
        "Reply with the full code only.\n\n```python\n" + CODE + "```"
    ),
    "text rewrite": "Correct the grammar of this paragraph. Reply with the corrected paragraph only.\n\n"
    + TEXT,
    "open chat": "Tell me a story about a lighthouse keeper who finds a message in a bottle.",
}

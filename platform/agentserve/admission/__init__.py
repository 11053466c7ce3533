"""Admission: whether the ingress takes a request, and when it sends it on. Ray-free.

What each module decides:
  admit.py            the ingress's parse-and-admit stage (Admit): the body validated, its
                      places taken, and the undo that gives them back
  adapter_names.py    which model and LoRA adapter a request's `model` names (404)
  shares.py           may the model hold one more request: capacity (503), each tenant's
                      fair share of the queue (429), the tokens a request reserves; the
                      admitted request's bookkeeping (AdmittedCall)
  quota.py            is the tenant within its own limits: requests/min, tokens/min,
                      concurrent requests (429), a Lease per admitted request
  quota_book.py       the same limits kept once for several ingress replicas (pure book)
  shared_limits.py    where the tenant limits live: this ingress (LocalQuota) or the
                      tenant-limits keeper shared by all ingress replicas (SharedQuota)
  admit_first.py      which comes first for a body: admission or its full validation
  priority.py         which admitted request is sent to the replicas next (earliest deadline
                      first), which batch request is shed (429), its engine priority
  response_budget.py  may a non-stream answer be buffered whole (400), and its byte cap

Nothing is imported here: `agentserve.admission.<module>` loads only what it names.
"""

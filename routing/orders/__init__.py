"""The store on the router's side: order questions answered from the store's own data.

``actions`` is the ``action`` route (lookups and changes through ``store.services``, offers waiting
for a "yes"); ``replies`` holds its templates; ``tools`` runs a remote model's store tool calls.
"""

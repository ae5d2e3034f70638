from django.contrib import admin
from django.contrib.auth.views import LogoutView
from django.urls import path
from django.views.i18n import JavaScriptCatalog, set_language

from chat import attachment_views, context_views, mail_views, views
from ops import candidates_views
from ops import views as ops_views
from routing import views as canary_views
from routing.gateway import views as gateway_views
from store import webhooks as store_webhooks

urlpatterns = [
    path("", views.storefront, name="storefront"),
    path("healthz", ops_views.healthz, name="healthz"),
    path("livez", ops_views.livez, name="livez"),
    path("admin/", admin.site.urls),
    # Attachments (docs/protocol.md, "Attachments"): upload (CORS for the widget's origins) and signed links.
    path("api/chat/attachments", attachment_views.attachment_upload, name="attachment-upload"),
    path("api/chat/attachments/<str:signed>", attachment_views.attachment_serve, name="attachment-serve"),
    # OpenAI-compatible gateway (docs/routing.md, "Gateway"): base URL http://HOST/v1 for any OpenAI client.
    path("v1/chat/completions", gateway_views.chat_completions, name="gateway-chat-completions"),
    # Shopify's catalog webhooks (docs/products.md, "Shopify"): the store's own face, like the gateway.
    path("api/store/shopify/webhooks", store_webhooks.shopify_webhook, name="shopify-webhooks"),
    # The widget's exchange of an e-mail's resume code (docs/email.md).
    path("api/chat/resume", mail_views.resume, name="chat-resume"),
    path("api/chat/transcript", mail_views.transcript, name="chat-transcript"),
    # A shopper's e-mailed reply, from Mailgun's inbound route (docs/email.md).
    path("api/email/inbound/mailgun", mail_views.mailgun_inbound, name="email-inbound-mailgun"),
    # Agent console (docs/console.md); its WebSocket is /ws/agent/ (chat/routing.py).
    path("console/", views.console, name="console"),
    path("console/conversations/<uuid:conversation_id>/", views.console_transcript, name="console-transcript"),
    path("console/conversations/<uuid:conversation_id>/task", views.console_task, name="console-task"),
    path("console/api/search", views.console_search, name="console-search"),
    path("console/api/products", views.console_products, name="console-products"),
    # Labels, the customer's context and canned replies (issue 32; docs/console.md).
    path("console/api/labels", context_views.labels_api, name="console-labels"),
    path("console/api/labels/<int:label_id>", context_views.label_api, name="console-label"),
    path(
        "console/api/labels/<int:label_id>/conversations",
        context_views.label_conversations_api,
        name="console-label-conversations",
    ),
    path(
        "console/api/conversations/<uuid:conversation_id>/labels",
        context_views.conversation_labels_api,
        name="console-conversation-labels",
    ),
    path(
        "console/api/conversations/<uuid:conversation_id>/context",
        context_views.conversation_context_api,
        name="console-conversation-context",
    ),
    path("console/api/canned", context_views.canned_api, name="console-canned"),
    path("console/api/canned/<int:reply_id>", context_views.canned_reply_api, name="console-canned-reply"),
    path("console/login/", views.ConsoleLoginView.as_view(), name="console-login"),
    # The staff pages' language switch (Django's set_language: POST language=en|zh-hans, kept in a
    # cookie) and their scripts' strings (the djangojs catalog); config/staff_locale.py.
    path("console/i18n/setlang/", set_language, name="set_language"),
    path("console/i18n/js/", JavaScriptCatalog.as_view(), name="javascript-catalog"),
    path("console/logout/", LogoutView.as_view(next_page="/console/login/"), name="console-logout"),
    # Ops (docs/ops.md): staff with the routing.view_costs permission; /metrics for Prometheus.
    path("ops/", ops_views.dashboard, name="ops"),
    path("ops/api/summary", ops_views.summary_api, name="ops-summary"),
    path("ops/faq-candidates/", candidates_views.candidates_page, name="ops-faq-candidates"),
    path("ops/api/faq-candidates", candidates_views.candidates_api, name="ops-faq-candidates-api"),
    # Canary rollout (docs/routing.md): Ops shows candidate and current side by side (read-only);
    # the decisions are the router's own (routing/views.py), like the gateway.
    path("ops/canary/", ops_views.canary_page, name="ops-canary"),
    path("ops/api/canary", ops_views.canary_api, name="ops-canary-api"),
    path("ops/canary/<str:tier>/<str:action>", canary_views.decide, name="canary-decide"),
    path("ops/api/series", ops_views.series_api, name="ops-series"),
    path("ops/export/ledger.csv", ops_views.ledger_csv, name="ops-ledger-csv"),
    path("metrics", ops_views.metrics, name="metrics"),
]

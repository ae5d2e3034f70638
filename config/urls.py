from django.contrib import admin
from django.urls import path

from chat import views

urlpatterns = [
    path("", views.storefront, name="storefront"),
    path("healthz", views.healthz, name="healthz"),
    path("admin/", admin.site.urls),
]

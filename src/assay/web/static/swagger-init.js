// Starts Swagger UI on the API docs page (/api/v1/docs). A file rather than FastAPI's inline script, so the
// page keeps a Content-Security-Policy without 'unsafe-inline'. The page says where the OpenAPI document is
// in data-openapi-url; the Swagger UI files themselves are served from this host (no CDN).
"use strict";

(function () {
  var root = document.getElementById("swagger-ui");
  if (!root || typeof window.SwaggerUIBundle !== "function") return;
  window.ui = window.SwaggerUIBundle({
    url: root.getAttribute("data-openapi-url"),
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    validatorUrl: null, // the default sends the document to validator.swagger.io: off-host
    presets: [window.SwaggerUIBundle.presets.apis, window.SwaggerUIBundle.SwaggerUIStandalonePreset],
  });
})();

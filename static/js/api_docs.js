// /v1/docs: starts the vendored Swagger UI with the settings the page carries as JSON.
// A static ES module (run after the deferred bundle): the CSP forbids inline scripts.

const settings = JSON.parse(document.getElementById("swagger-settings").textContent);

window.SwaggerUIBundle({
  ...settings,
  dom_id: "#swagger-ui",
  presets: [window.SwaggerUIBundle.presets.apis],
});

// qag's /docs page start-up: a file of its own so that the page's Content-Security-Policy allows no inline script.
(function () {
  "use strict";
  var STORAGE = "qag-key";  // sessionStorage: the key lives as long as this tab, never on disk
  var field = document.getElementById("key");
  field.addEventListener("input", function () { sessionStorage.setItem(STORAGE, field.value); });
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#ui",
    persistAuthorization: false,
    // Never a validator badge: it is an image from validator.swagger.io, another origin, told this document's URL.
    validatorUrl: null,
    requestInterceptor: function (request) {
      var key = sessionStorage.getItem(STORAGE);
      if (key) request.headers["X-API-Key"] = key;
      return request;
    }
  });
  // /openapi.json lists what its caller may call (an anonymous caller: the public routes): read it again as the
  // key just typed.
  field.addEventListener("change", function () { window.ui.specActions.download("/openapi.json"); });
})();

package oaierror

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestBody(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		status     int
		param, typ string
		nullParam  bool
	}{
		{400, "prompt", "BadRequestError", false},
		{404, "model", "NotFoundError", false},
		{413, "", "BadRequestError", true},
		{429, "", "RateLimitError", true},
		{503, "", "ServiceUnavailableError", true},
		{502, "", "InternalServerError", true},
	} {
		var got struct {
			Error map[string]any `json:"error"`
		}
		if err := json.Unmarshal(Body(c.status, c.param, "m"), &got); err != nil {
			t.Fatal(err)
		}
		e := got.Error
		if e["message"] != "m" || e["type"] != c.typ || e["code"] != float64(c.status) || len(e) != 4 {
			t.Errorf("%d: %v", c.status, e)
		}
		if p, ok := e["param"]; !ok || (c.nullParam && p != nil) || (!c.nullParam && p != c.param) {
			t.Errorf("%d: param %v, want %q", c.status, p, c.param)
		}
	}
	w := httptest.NewRecorder()
	Write(w, http.StatusNotFound, "model", "no")
	if w.Code != 404 || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("Write: %d %v", w.Code, w.Header())
	}
}

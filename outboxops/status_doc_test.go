package outboxops_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/outboxops"
	"github.com/wmoutbox/outbox/outboxtest"
	"github.com/wmoutbox/outbox/recordstore"
)

// TestOperationsDocShowsTheStatusJSON keeps the status handler's JSON in
// docs/operations.md the shape the handler serves: the same keys at every
// level, with values of the same JSON types. The handler renders a status
// whose every field is set, so a field added to TopicStatus or
// ConsumerStatus fails this test until the doc shows it.
func TestOperationsDocShowsTheStatusJSON(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	section := between(t, string(doc), "## HTTP status\n", "\n## ")
	block := between(t, section, "```json\n", "```")
	var documented any
	require.NoError(t, json.Unmarshal([]byte(block), &documented), "docs/operations.md's status JSON: %s", block)

	st := filled(reflect.TypeOf(recordstore.TopicStatus{})).Interface().(recordstore.TopicStatus)
	st.Topic = "orders"
	st.OldestPending = 0 // healthy: within MaxPendingAge
	store := fixedStatusStore{Store: outboxtest.NewStore(outboxtest.StoreConfig{}), status: []recordstore.TopicStatus{st}}
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
	require.NoError(t, err)
	h, err := outboxops.NewStatusHandler(reg, outboxops.StatusHandlerConfig{Full: true}, nil)
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/outbox/status", nil))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var served any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &served))

	require.Equal(t, jsonShape(served), jsonShape(documented),
		"docs/operations.md's status JSON (## HTTP status) must have the keys the handler serves:\nserved: %s", rec.Body.String())
}

// fixedStatusStore reports the same status, whatever its table holds.
type fixedStatusStore struct {
	*outboxtest.Store
	status []recordstore.TopicStatus
}

func (s fixedStatusStore) Status(context.Context) ([]recordstore.TopicStatus, error) {
	return s.status, nil
}

func (s fixedStatusStore) PendingStatus(context.Context) ([]recordstore.TopicStatus, error) {
	return s.status, nil
}

// filled returns a value of type t with every field set to a non-zero value
// and every slice holding one filled element, so that no omitempty key is
// left out of its JSON.
func filled(t reflect.Type) reflect.Value {
	v := reflect.New(t).Elem()
	switch t.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1)
	case reflect.Slice:
		v.Set(reflect.Append(v, filled(t.Elem())))
	case reflect.Pointer:
		p := reflect.New(t.Elem())
		p.Elem().Set(filled(t.Elem()))
		v.Set(p)
	case reflect.Struct:
		for i := range t.NumField() {
			if t.Field(i).IsExported() {
				v.Field(i).Set(filled(t.Field(i).Type))
			}
		}
	}
	return v
}

// jsonShape describes a decoded JSON value by its keys and types: objects
// as their sorted keys with each value's shape, arrays by the shape of their
// first element, other values by their JSON type. The status's only
// nullable values are ages not known yet (last_seen_seconds_ago of a
// receiver never seen), so null counts as a number.
func jsonShape(v any) string {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + ": " + jsonShape(v[k])
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case []any:
		if len(v) == 0 {
			return "[]"
		}
		return "[" + jsonShape(v[0]) + "]"
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	case nil:
		return "number"
	}
	return reflect.TypeOf(v).String()
}

// between is the text of s from after begin to before the next end.
func between(t *testing.T, s, begin, end string) string {
	t.Helper()
	i := strings.Index(s, begin)
	require.GreaterOrEqual(t, i, 0, "missing %q", begin)
	rest := s[i+len(begin):]
	j := strings.Index(rest, end)
	require.GreaterOrEqual(t, j, 0, "missing %q", end)
	return rest[:j]
}

package outbox_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxops"
	"github.com/wmoutbox/outbox/sqlstore"
)

// statusBody is the JSON the status handler serves, read back generically so
// that the test checks the wire format.
type statusBody struct {
	Healthy bool   `json:"healthy"`
	Error   string `json:"error"`
	Topics  []struct {
		Topic         string  `json:"topic"`
		Pending       int64   `json:"pending"`
		OldestPending float64 `json:"oldest_pending_seconds"`
		Abandoned     int64   `json:"abandoned"`
		Completed     int64   `json:"completed"`
	} `json:"topics"`
}

func getStatus(t *testing.T, h http.Handler) (int, statusBody) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/outbox/status", nil))
	assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	var body statusBody
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
	return rec.Code, body
}

func TestStatusHandler(t *testing.T) {
	t.Parallel()

	t.Run("HealthyUntilTheOldestPendingRecordIsTooOld", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msgs := b.publishTracked(t, 3)
			_, err := b.middleware(t)((&recordingHandler{}).handle)(msgs[0])
			require.NoError(t, err)
			h, err := outboxops.NewStatusHandler(b.reg, outboxops.StatusHandlerConfig{MaxPendingAge: time.Hour, Full: true}, b.logger)
			require.NoError(t, err)

			code, body := getStatus(t, h)
			assert.Equal(t, http.StatusOK, code)
			assert.True(t, body.Healthy)
			require.Len(t, body.Topics, 1)
			assert.Equal(t, b.topic, body.Topics[0].Topic)
			assert.EqualValues(t, 2, body.Topics[0].Pending)
			assert.EqualValues(t, 1, body.Topics[0].Completed)
			assert.Less(t, body.Topics[0].OldestPending, 3600.0)

			b.backdate(t, "created_at", idOf(t, msgs[1]))
			code, body = getStatus(t, h)
			assert.Equal(t, http.StatusServiceUnavailable, code)
			assert.False(t, body.Healthy)
			assert.Greater(t, body.Topics[0].OldestPending, 3600.0)
		})
	})

	t.Run("UnreadableStoreIsUnhealthy", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			b.store.Attach(closedDB(t, backend))
			h, err := outboxops.NewStatusHandler(b.reg, outboxops.StatusHandlerConfig{}, nil)
			require.NoError(t, err)
			code, body := getStatus(t, h)
			assert.Equal(t, http.StatusServiceUnavailable, code)
			assert.False(t, body.Healthy)
			assert.NotEmpty(t, body.Error)
		})
	})

	t.Run("ErrorKeepsInternalsOut", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Backends()[0], sqlstore.Mark)
		unreachable, err := sqlx.Open("pgx", "postgres://postgres@127.0.0.1:1/test?connect_timeout=1")
		require.NoError(t, err)
		defer unreachable.Close()
		b.store.Attach(unreachable)
		h, err := outboxops.NewStatusHandler(b.reg, outboxops.StatusHandlerConfig{}, b.logger)
		require.NoError(t, err)
		code, body := getStatus(t, h)
		assert.Equal(t, http.StatusServiceUnavailable, code)
		assert.NotContains(t, body.Error, b.store.Table(), "no table name")
		assert.NotContains(t, body.Error, "127.0.0.1", "no database address")
		assert.Contains(t, body.Error, "log")
		logged := b.logger.Entries("error")
		require.Len(t, logged, 1)
		assert.Contains(t, logged[0].Err.Error(), "127.0.0.1:1", "the cause is logged")
	})

	t.Run("NamesWithoutRecordsReportZero", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Backends()[0], sqlstore.Mark)
		h, err := outboxops.NewStatusHandler(b.reg, outboxops.StatusHandlerConfig{}, nil)
		require.NoError(t, err)
		code, body := getStatus(t, h)
		assert.Equal(t, http.StatusOK, code)
		require.Len(t, body.Topics, 1)
		assert.Zero(t, body.Topics[0].Pending)
	})
}

package testenv

import (
	"sync"

	"github.com/ThreeDotsLabs/watermill"
)

// LogEntry is one captured log line.
type LogEntry struct {
	Level  string
	Msg    string
	Err    error
	Fields watermill.LogFields
}

// CaptureLogger is a watermill.LoggerAdapter that keeps what it is told.
type CaptureLogger struct {
	mu      sync.Mutex
	entries []LogEntry
	fields  watermill.LogFields
	parent  *CaptureLogger
}

func (l *CaptureLogger) root() *CaptureLogger {
	if l.parent != nil {
		return l.parent.root()
	}
	return l
}

func (l *CaptureLogger) add(level, msg string, err error, fields watermill.LogFields) {
	r := l.root()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entries = append(r.entries, LogEntry{Level: level, Msg: msg, Err: err, Fields: l.fields.Add(fields)})
}

// Error implements watermill.LoggerAdapter.
func (l *CaptureLogger) Error(msg string, err error, fields watermill.LogFields) {
	l.add("error", msg, err, fields)
}

// Info implements watermill.LoggerAdapter.
func (l *CaptureLogger) Info(msg string, fields watermill.LogFields) { l.add("info", msg, nil, fields) }

// Debug implements watermill.LoggerAdapter.
func (l *CaptureLogger) Debug(msg string, fields watermill.LogFields) {
	l.add("debug", msg, nil, fields)
}

// Trace implements watermill.LoggerAdapter.
func (l *CaptureLogger) Trace(msg string, fields watermill.LogFields) {
	l.add("trace", msg, nil, fields)
}

// With implements watermill.LoggerAdapter.
func (l *CaptureLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return &CaptureLogger{parent: l, fields: l.fields.Add(fields)}
}

// Entries returns the captured lines at a level ("" for all).
func (l *CaptureLogger) Entries(level string) []LogEntry {
	r := l.root()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []LogEntry
	for _, e := range r.entries {
		if level == "" || e.Level == level {
			out = append(out, e)
		}
	}
	return out
}

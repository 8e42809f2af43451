ALTER TABLE {{.ReceiversTable}} RENAME TO {{.SeenName}};
ALTER TABLE {{.SeenTable}} RENAME CONSTRAINT {{.ReceiversIndex "pkey"}} TO {{.SeenIndex "pkey"}};

-- The restore epoch (quan-recover, deploy/local/backup.sh). Same definition in ds_0 and ds_1.

\ir ../both/0014_restore_epoch.sql
